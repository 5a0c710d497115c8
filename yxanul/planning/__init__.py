"""Memory planning: what a training step holds per GPU under each parallel strategy (`yxanul plan`)."""
