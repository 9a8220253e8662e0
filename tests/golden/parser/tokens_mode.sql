SELECT tokens, score FROM TOKENS('The capital of Greece is [MASK].') USING dense(k => 4096) LIMIT 10
