"""The drift stage: a long running sum kept in a narrow float format (the drift note), simulated and reported."""
