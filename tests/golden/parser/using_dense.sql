SELECT phrase FROM MASKED('x [MASK]') USING dense(k => 1024)
