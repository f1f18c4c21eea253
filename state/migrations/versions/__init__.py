"""One file per schema revision, oldest first: `NNNN_what_it_changes.py`."""
