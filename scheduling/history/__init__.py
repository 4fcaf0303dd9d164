"""The portal's own history: compact rollups of the cluster, its nodes, GPUs and teams over time."""
