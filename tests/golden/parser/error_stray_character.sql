SELECT phrase FROM MASKED('[MASK]') WHERE score # 2
