SELECT phrase FROM MASKED('[MASK]') WITH tau = .5, alpha = 1., eps = 1e-3, big = 2.5E+10, neg = -7, negf = -0.25 WHERE x IN (0, 9223372036854775807, -9223372036854775807, 0.1)
