"""Cloud bindings: the EC2 provisioner (boto3), its instance catalog and prices."""
