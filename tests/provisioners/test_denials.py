"""A call AWS denies says, in one line, which IAM action it needed and on what: AWS's own
answer (`AccessDenied`, `UnauthorizedOperation`, or a bare 403 to a HEAD) names neither.

AWS's answers are played by botocore's Stubber, which stands in for the HTTP exchange only:
the handlers under test run as they do against AWS.
"""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from autoscaler.cloud import CloudRequestError
from executor.storage import S3Storage, StorageError
from provisioners.aws import POLICY_HINT, AwsCaller, explain_denials, make_client


def test_a_head_of_a_missing_or_forbidden_object_names_get_object_and_list_bucket():
    s3 = make_client("s3", "us-east-1")
    with Stubber(s3) as stub:
        stub.add_client_error(
            "head_object", service_error_code="403", service_message="Forbidden",
            http_status_code=403,
        )  # fmt: skip
        with pytest.raises(ClientError) as denied:
            s3.head_object(Bucket="artifacts", Key="team/contexts/abc.tar.gz")
    message = str(denied.value)
    assert (
        "is not allowed s3:GetObject on arn:aws:s3:::artifacts/team/contexts/abc.tar.gz" in message
    )
    assert "s3:ListBucket on arn:aws:s3:::artifacts for that prefix" in message
    assert POLICY_HINT in message and "\n" not in message


def test_the_daemons_storage_says_which_action_a_denied_upload_needed():
    storage = S3Storage("artifacts", "team", region_name="us-east-1")
    explain_denials(storage.client)
    with Stubber(storage.client) as stub:
        stub.add_client_error(
            "put_object", service_error_code="AccessDenied", service_message="Access Denied",
            http_status_code=403,
        )  # fmt: skip
        with pytest.raises(StorageError) as denied:
            storage.put_bytes("contexts/x.tar.gz", b"data")
    assert "s3:PutObject on arn:aws:s3:::artifacts/team/contexts/x.tar.gz" in str(denied.value)


def test_an_unauthorized_ec2_call_is_one_line_naming_its_action_before_the_encoded_message():
    ec2 = make_client("ec2", "us-east-1")
    encoded = "Encoded authorization failure message: " + "x" * 900
    with Stubber(ec2) as stub:
        stub.add_client_error(
            "terminate_instances", service_error_code="UnauthorizedOperation",
            service_message=f"You are not authorized to perform this operation. {encoded}",
            http_status_code=403,
        )  # fmt: skip
        with pytest.raises(CloudRequestError) as denied:
            AwsCaller(ec2).call("terminate_instances", InstanceIds=["i-0123456789abcdef0"])
    message = str(denied.value)
    assert message.startswith("EC2 TerminateInstances failed: UnauthorizedOperation: ")
    assert "is not allowed ec2:TerminateInstances" in message and POLICY_HINT in message
    assert "\n" not in message and len(message) < 400


def test_other_errors_are_left_as_aws_said_them():
    s3 = make_client("s3", "us-east-1")
    with Stubber(s3) as stub:
        stub.add_client_error(
            "head_object", service_error_code="404", service_message="Not Found",
            http_status_code=404,
        )  # fmt: skip
        with pytest.raises(ClientError) as missing:
            s3.head_object(Bucket="artifacts", Key="k")
    assert "is not allowed" not in str(missing.value)
