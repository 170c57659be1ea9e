"""rlconf training engine."""
