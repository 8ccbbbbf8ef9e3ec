"""Starting rank processes: on this machine (``local.py``) or on Slurm (``slurm.py``)."""
