SELECT phrase FROM MASKED('[MASK]') WHERE a = 1 AND b != 2 AND c <> 3 AND d < 4 AND e <= 5 AND f > 6 AND g >= 7 AND (h = i) = TRUE
