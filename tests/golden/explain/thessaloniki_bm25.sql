SELECT phrase, score, support FROM MASKED('Thessaloniki is a city in [MASK].') USING bm25(blocks => 3) WITH max_len = 10, tau = 1.0 ORDER BY score DESC LIMIT 5
