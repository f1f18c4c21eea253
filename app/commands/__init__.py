"""The `autoscaler` subcommands, one module per group; each has a `register(subparsers)`."""
