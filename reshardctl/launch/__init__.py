"""Starting rank processes: on this machine (``local``), later Slurm."""
