"""Architecture search algorithms that work on whole architectures (regularized evolution);
DARTS's components are in torchloom.zoo.nas and its search mode in the engine."""
