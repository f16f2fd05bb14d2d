"""sgemm-lab's Hydra plugins: the tuning sweeper (`hydra/sweeper=tune`, see tune_sweeper.py).

Hydra finds plugins only in the `hydra_plugins` namespace package, so this small package lives
there; the work it drives is in src/tune/space.py."""
