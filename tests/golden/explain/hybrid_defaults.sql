SELECT * FROM MASKED('Salem is the capital of [MASK].') USING hybrid(k => 512, blocks => 2)
