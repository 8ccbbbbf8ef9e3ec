"""`reshardctl calibrate`: microbenchmarks on a site's own ranks, written as a calibration file.

``microbench.py`` runs inside every rank (a process group over the site's launcher); ``runner.py``
starts the ranks (local processes today), fits the figures the cost model reads and builds the file
(``site/measured.py`` reads it back).
"""
