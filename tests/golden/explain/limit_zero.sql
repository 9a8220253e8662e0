SELECT phrase FROM MASKED('Paris is in [MASK].') LIMIT 0
