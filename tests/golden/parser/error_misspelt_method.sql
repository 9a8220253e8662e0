SELECT phrase FROM MASKED('x [MASK]') USING bm52(blocks => 3)
