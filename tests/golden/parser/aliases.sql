SELECT phrase AS answer, score AS "Score", length(phrase) AS n, "end" AS stop FROM MASKED('[MASK] is big')
