"""Curves between two models in one parameterisation (Garipov et al., NeurIPS 2018): a Bezier curve or a
polygonal chain whose bends are trained with the ends fixed (glmc.curves.curve), fitted with checkpoints
and resume (glmc.curves.fit). Importing this package loads no training library."""
