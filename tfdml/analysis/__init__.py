"""Analysis tools of "Extreme triplet learning": the triplet scatter diagram and the
gradient vector field."""
