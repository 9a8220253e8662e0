SELECT title, score FROM MASKED('[MASK]') GROUP BY Document ORDER BY score DESC
