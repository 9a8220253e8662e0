SELECT phrase FROM MASKED('[MASK]') WITH tau = 1, TAU = 2
