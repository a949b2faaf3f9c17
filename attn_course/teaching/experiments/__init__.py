"""Experiments the chapters run to show a claim: the score scaling of chapter 02, the two-relation heads of
chapter 03, the learning curves of position schemes in chapter 05, their length extrapolation and attention
sinks in chapter 09. The models they train live in :mod:`attn_course.models`."""
