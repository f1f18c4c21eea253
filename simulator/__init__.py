"""The simulated world for replays: `engine` (discrete events on a virtual clock),
`world` (a simulated `Cloud` and `Executor` with hidden interference), `replay`
(the core's `ControlLoop` driven through a trace), `traces`, `baselines` (the Eva
paper's schedulers) and `bound` (lower bounds no schedule goes below).
"""
