SELECT tokens, score FROM TOKENS('The capital of Greece is [MASK].') USING dense(k => 256) LIMIT 10
