"""Weight matching's engine: the search that glmc.matching.weight runs, and that the other methods build on
(weight_refined starts from its answer and reuses its head and unit costs, rotation adds its closed-form
in-head maps, learned matching starts from its answer and projects latents with its solvers). Activation
matching uses none of it.

problem         what the search computes once (MatchingProblem), where it stands (SearchState), the objective
steps           the steps of one iteration, chosen once for the models at hand
residual_map    the residual step's cross-covariances, the mean-keeping projection, the map's angles
heads           circuits (paper 001's head cost), in_head (closed-form in-head maps), rotary_pairs (rotary
                query/key pairs), head_hidden (a task head's hidden units)
units, scales   mlp_units (how MLP units compare, gated MLPs' scales), mlp_distance (the MLP distance kept
                across iterations), scales (the best rescaling of a writer against its reader)
solvers         assignment (per-layer Hungarian solves), warm_assignment (certificates that carry an
                assignment over), device_assignment (a certified auction on the device), projections
                (latent matrices to group elements, the host/device decompositions)
experts         the step for mixtures of experts (blocks.moe's weight_step)
layerwise       B's layers transformed as they are read, never held whole
"""
