"""Experiments the chapters run to show a claim: the score scaling of chapter 02, the two-relation
heads of chapter 03, length extrapolation of position schemes in chapter 09."""
