SELECT phrase, score LIMIT 5
