"""The tests' IAM evaluator (`tests/aws_iam.py`) against AWS's documented evaluation rules
("Policy evaluation logic", "IAM JSON policy elements: Condition operators", "Policy
variables" in the IAM User Guide): the suite's checks of the shipped policies are only as
good as this."""

from __future__ import annotations

import pytest

from tests.aws_iam import Policy, Request, glob_match, requests_for


def policy(*statements: dict) -> Policy:
    return Policy({"Version": "2012-10-17", "Statement": list(statements)})


def allow(action="*", resource="*", **extra) -> dict:
    return {"Effect": "Allow", "Action": action, "Resource": resource, **extra}


def test_an_explicit_deny_wins_over_any_allow():
    doc = policy(
        allow("s3:*", "arn:aws:s3:::b/*", Sid="All"),
        {
            "Sid": "NoSecrets",
            "Effect": "Deny",
            "Action": "s3:GetObject",
            "Resource": "arn:aws:s3:::b/secret/*",
        },
    )
    assert doc.evaluate(Request("s3:GetObject", "arn:aws:s3:::b/public/x")).allowed
    denied = doc.evaluate(Request("s3:GetObject", "arn:aws:s3:::b/secret/x"))
    assert not denied.allowed and denied.reason == "explicitly denied by NoSecrets"


def test_what_no_statement_allows_is_denied_by_default():
    decision = policy(allow("s3:GetObject", "arn:aws:s3:::b/*")).evaluate(
        Request("s3:PutObject", "arn:aws:s3:::b/x")
    )
    assert not decision.allowed and "implicit deny" in decision.reason


def test_actions_compare_case_insensitively_and_resources_case_sensitively():
    doc = policy(allow("S3:getobject", "arn:aws:s3:::Bucket/*"))
    assert doc.evaluate(Request("s3:GetObject", "arn:aws:s3:::Bucket/k")).allowed
    assert not doc.evaluate(Request("s3:GetObject", "arn:aws:s3:::bucket/k")).allowed


def test_wildcards_span_slashes_and_question_marks_match_one_character():
    assert glob_match("arn:aws:s3:::b/jobs/*", "arn:aws:s3:::b/jobs/j/t/1/checkpoint.tar.gz")
    assert glob_match("ec2:Describe*", "ec2:DescribeInstances")
    assert glob_match("a?c", "abc") and not glob_match("a?c", "abbc")


def test_not_action_and_not_resource_match_everything_else():
    doc = policy(
        {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"},
        {"Sid": "NotThere", "Effect": "Deny", "Action": "s3:*", "NotResource": "arn:aws:s3:::ok/*"},
    )
    assert doc.evaluate(Request("s3:GetObject", "arn:aws:s3:::ok/k")).allowed
    assert not doc.evaluate(Request("iam:PassRole", "arn:aws:iam::1:role/r")).allowed
    assert doc.evaluate(Request("s3:GetObject", "arn:aws:s3:::other/k")).reason == (
        "explicitly denied by NotThere"
    )


def test_keys_of_a_condition_are_anded_and_values_of_a_key_ored():
    doc = policy(
        allow(
            "ec2:RunInstances",
            Condition={
                "StringEquals": {
                    "aws:RequestTag/team": ["ml", "infra"],
                    "aws:RequestTag/env": "prod",
                }
            },
        )
    )
    ok = {"aws:RequestTag/team": "infra", "aws:RequestTag/env": "prod"}
    assert doc.evaluate(Request("ec2:RunInstances", "*", ok)).allowed
    assert not doc.evaluate(
        Request("ec2:RunInstances", "*", {**ok, "aws:RequestTag/env": "dev"})
    ).allowed
    assert not doc.evaluate(Request("ec2:RunInstances", "*", {"aws:RequestTag/team": "ml"})).allowed


def test_condition_key_names_are_case_insensitive_but_tag_keys_are_not():
    doc = policy(allow(Condition={"StringEquals": {"AWS:RequestTag/Team": "ml"}}))
    assert doc.evaluate(Request("x:Y", "*", {"aws:requesttag/Team": "ml"})).allowed
    assert not doc.evaluate(Request("x:Y", "*", {"aws:RequestTag/team": "ml"})).allowed


def test_string_like_matches_wildcards_and_string_equals_does_not():
    like = policy(allow(Condition={"StringLike": {"s3:prefix": ["team/*"]}}))
    equals = policy(allow(Condition={"StringEquals": {"s3:prefix": ["team/*"]}}))
    request = Request("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "team/jobs/"})
    assert like.evaluate(request).allowed and not equals.evaluate(request).allowed


def test_a_missing_key_fails_a_positive_operator_and_satisfies_a_negated_one():
    positive = policy(allow(Condition={"StringEquals": {"aws:RequestTag/team": "ml"}}))
    negated = policy(allow(Condition={"StringNotEquals": {"aws:RequestTag/team": "ml"}}))
    if_exists = policy(allow(Condition={"StringEqualsIfExists": {"aws:RequestTag/team": "ml"}}))
    bare = Request("x:Y", "*")
    assert not positive.evaluate(bare).allowed
    assert negated.evaluate(bare).allowed
    assert if_exists.evaluate(bare).allowed
    assert not if_exists.evaluate(Request("x:Y", "*", {"aws:RequestTag/team": "web"})).allowed


def test_bool_and_null():
    secure = policy(allow(Condition={"Bool": {"aws:SecureTransport": "true"}}))
    assert secure.evaluate(Request("x:Y", "*", {"aws:SecureTransport": "true"})).allowed
    assert not secure.evaluate(Request("x:Y", "*", {"aws:SecureTransport": "false"})).allowed
    untagged = policy(allow(Condition={"Null": {"aws:RequestTag/team": "true"}}))
    assert untagged.evaluate(Request("x:Y", "*")).allowed
    assert not untagged.evaluate(Request("x:Y", "*", {"aws:RequestTag/team": "ml"})).allowed


def test_set_operators_on_multivalued_keys():
    only = policy(allow(Condition={"ForAllValues:StringEquals": {"aws:TagKeys": ["a", "b"]}}))
    any_of = policy(allow(Condition={"ForAnyValue:StringEquals": {"aws:TagKeys": ["a"]}}))
    assert only.evaluate(Request("x:Y", "*", {"aws:TagKeys": ["a"]})).allowed
    assert not only.evaluate(Request("x:Y", "*", {"aws:TagKeys": ["a", "c"]})).allowed
    assert only.evaluate(Request("x:Y", "*")).allowed  # vacuously true: no value to fail
    assert any_of.evaluate(Request("x:Y", "*", {"aws:TagKeys": ["c", "a"]})).allowed
    assert not any_of.evaluate(Request("x:Y", "*")).allowed


def test_policy_variables_take_the_requests_values_and_a_missing_one_matches_nothing():
    doc = policy(
        allow(
            "ec2:TerminateInstances",
            "arn:aws:ec2:*:*:instance/*",
            Condition={"StringEquals": {"ec2:ResourceTag/cluster": "${aws:PrincipalTag/cluster}"}},
        ),
        allow("s3:GetObject", "arn:aws:s3:::b/${aws:PrincipalTag/cluster}/*"),
        allow("s3:PutObject", "arn:aws:s3:::b/literal-${*}/*"),
    )
    mine = {"aws:PrincipalTag/cluster": "c1", "ec2:ResourceTag/cluster": "c1"}
    theirs = {"aws:PrincipalTag/cluster": "c1", "ec2:ResourceTag/cluster": "c2"}
    arn = "arn:aws:ec2:us-east-1:1:instance/i-1"
    assert doc.evaluate(Request("ec2:TerminateInstances", arn, mine)).allowed
    assert not doc.evaluate(Request("ec2:TerminateInstances", arn, theirs)).allowed
    principal = {"aws:PrincipalTag/cluster": "c1"}
    assert doc.evaluate(Request("s3:GetObject", "arn:aws:s3:::b/c1/k", principal)).allowed
    assert not doc.evaluate(Request("s3:GetObject", "arn:aws:s3:::b/c2/k", principal)).allowed
    assert not doc.evaluate(Request("s3:GetObject", "arn:aws:s3:::b/c1/k")).allowed  # no tag
    assert doc.evaluate(Request("s3:PutObject", "arn:aws:s3:::b/literal-*/k")).allowed
    assert not doc.evaluate(Request("s3:PutObject", "arn:aws:s3:::b/literal-x/k")).allowed


def test_an_operator_the_evaluator_does_not_know_is_an_error_not_a_guess():
    doc = policy(allow(Condition={"DateGreaterThan": {"aws:CurrentTime": "2020-01-01"}}))
    with pytest.raises(NotImplementedError):
        doc.evaluate(Request("x:Y", "*", {"aws:CurrentTime": "2021-01-01"}))


# -- calls to requests ---------------------------------------------------------------------------


def test_a_launch_authorizes_every_resource_it_touches_and_the_tags_and_role_it_implies():
    params = {
        "ImageId": "ami-1",
        "NetworkInterfaces": [{"SubnetId": "subnet-1", "Groups": ["sg-1"]}],
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": [{"Key": "autoscaler:cluster", "Value": "c"}]},
            {"ResourceType": "volume", "Tags": [{"Key": "autoscaler:cluster", "Value": "c"}]},
        ],
        "IamInstanceProfile": {"Name": "workers"},
    }
    found = requests_for("ec2", "RunInstances", params, region="us-east-1", account="123")
    by_action: dict[str, list[str]] = {}
    for r in found:
        by_action.setdefault(r.action, []).append(r.resource)
    ec2 = "arn:aws:ec2:us-east-1:123"
    assert sorted(by_action["ec2:RunInstances"]) == sorted(
        [
            f"{ec2}:instance/*",
            f"{ec2}:volume/*",
            f"{ec2}:network-interface/*",
            "arn:aws:ec2:us-east-1::image/ami-1",
            f"{ec2}:subnet/subnet-1",
            f"{ec2}:security-group/sg-1",
        ]
    )
    assert by_action["ec2:CreateTags"] == [f"{ec2}:instance/*", f"{ec2}:volume/*"]
    assert by_action["iam:PassRole"] == ["arn:aws:iam::123:role/workers"]
    [tags] = [r for r in found if r.action == "ec2:CreateTags"][:1]
    assert tags.context["ec2:CreateAction"] == "RunInstances"
    assert tags.context["aws:RequestTag/autoscaler:cluster"] == "c"


def test_s3_calls_map_to_their_iam_actions_with_the_prefix_of_a_listing():
    def one(operation, **params):
        [request] = requests_for("s3", operation, params, region="us-east-1", account="1")
        return request

    assert one("HeadObject", Bucket="b", Key="p/k").action == "s3:GetObject"
    assert one("UploadPart", Bucket="b", Key="p/k").resource == "arn:aws:s3:::b/p/k"
    listing = one("ListObjectsV2", Bucket="b", Prefix="p/jobs/")
    assert (listing.action, listing.resource) == ("s3:ListBucket", "arn:aws:s3:::b")
    assert listing.context["s3:prefix"] == "p/jobs/"
