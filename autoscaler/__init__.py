"""Cost-optimizing cluster autoscaler for batch jobs on EC2.

The pure planning core lives here: the domain model (`resources`, `catalog`,
`jobs`, `configuration`), pricing (`pricing`), the co-location throughput table
(`throughput`), Eva's reconfiguration algorithms (`reconfiguration`), the
migration criterion (`criterion`) and the planner that ties them together
(`planner`). None of it performs I/O or reads a clock.
"""

__version__ = "0.1.0"
