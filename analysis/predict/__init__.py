"""The calibrated time and memory model: calibration, predictions, what-ifs.
``python -m analysis.predict LOGDIR``."""
