"""The drift stage: a long running sum kept in a narrow float format (the second seed document), simulated and reported."""
