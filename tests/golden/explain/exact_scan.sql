SELECT phrase FROM MASKED('The currency of Japan is the [MASK].') USING exact(k => 64) WITH scoring = raw, alpha = 0.5 LIMIT 3
