"""The core: what to run where, and the round that gets there — no I/O, no clock.

- The domain: `resources`, `catalog` (instance types and prices), `jobs`
  (job and task specs, demand rules), `work` (a job's work alone at full
  speed: the one reading of a trace's duration and iterations),
  `configuration` (instances and the tasks on them), `view` (what a planner
  sees).
- Pricing and learning: `pricing` (reservation price, TNRP; Eva §4.2, §4.4),
  `throughput` (the co-location table; §4.3), `lp` and `patterns`
  (CvxCluster's shadow prices; the configuration LP), `fluid` (two-stage
  packing for many distinct demands), `bounds` (honest yardsticks: the
  whole-task and configuration LPs' bounds, the MIP optimum of small inputs).
- Deciding: `reconfiguration` (Full and Partial Reconfiguration; Algorithm 1),
  `criterion` (the migration criterion S·D̂ − M), `planner` (the planners by
  name), `decide` (a round and a step as pure functions of a snapshot).
- The round and its interfaces: `cloud` (`Cloud`), `execution` (`Executor`,
  `Clock`), `store` (`Store` and the records it holds), `transitions` (the
  state's status machine and ledger rules, which every `Store` binding calls),
  `control` (sync → snapshot → decide → record → act, against those interfaces
  only), `period` (how often a round runs, and the throughput window that
  follows it).

The bindings (`provisioners`, `executor`, `state`, `simulator`) import this
package; it imports none of them, and the application (`app`) none either
(import contracts in pyproject.toml). `data/eva/` is package data: the Eva
artifact's trace, catalog and contention matrix.
"""

__version__ = "0.1.0"
