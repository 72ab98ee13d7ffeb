"""Running experiment grids (`experiments/reproduce.py`, `experiments/width_study.py`): cells, launchers, the final check."""
