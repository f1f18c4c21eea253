"""Cloud bindings: the EC2 provisioner (boto3), its instance catalog and prices."""

import logging

# A library logs; the application decides where it goes. Without this, Python's
# last-resort handler would print every warning to stderr of every command.
logging.getLogger(__name__).addHandler(logging.NullHandler())
