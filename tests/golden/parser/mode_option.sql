SELECT phrase FROM MASKED('x [MASK] y') WITH mode = token, scoring = 'raw', exact = FALSE, k = 512
