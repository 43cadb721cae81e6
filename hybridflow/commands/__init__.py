"""The command-line front ends that compile, profile, simulate and draw (``hybridflow compile|profile|simulate|viz``).

They sit above the compiler, the runtime and viz, which they use; ``hybridflow.cli`` imports each one only when its
command runs. (``hybridflow run`` and ``quickstart`` live with the trainer.)
"""
