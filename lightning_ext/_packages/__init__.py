"""Lightning's two packages, ``lightning`` and ``pytorch_lightning``: which one a module uses, and the mirror."""
