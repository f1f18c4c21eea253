"""Upper bounds on the numbers users give, far above anything real.

An absurd value is refused where it is read, naming the field, instead of
hanging a replay (a start-up delay of 10¹² s) or breaking the LP (a price of
$10³⁰⁰/h). Plain constants, so the parsers of catalogs, traces and job files
(and the schema models in `validation.py`) share them without importing
each other.
"""

#: A start-up, checkpoint or launch delay: a day is already not a delay.
MAX_DELAY_S = 86_400.0
#: An instance type's price: EC2's dearest costs a few hundred dollars an hour.
MAX_HOURLY_COST = 100_000.0
#: An instance type's capacity: GPUs, cores, GiB.
MAX_CAPACITY = (1_024.0, 100_000.0, 100_000_000.0)
#: A job's `max_cost` (dollars): a billion is no cap anyone means.
MAX_JOB_COST = 1_000_000_000.0
