"""Teams, memberships, priority classes and quotas: who may use how much of the cluster."""
