SELECT phrase FROM MASKED('[MASK]') USING dense(k = 5)
