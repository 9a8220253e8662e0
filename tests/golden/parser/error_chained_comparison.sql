SELECT phrase FROM MASKED('[MASK]') WHERE a = b = c
