-- every clause, in order, over several lines
SELECT phrase, score, support, evidence
FROM MASKED('Hagios Demetrios is located in [MASK].')
  AS OF 'wiki-2019'
  USING hybrid(k => 1024, blocks => 3)
  WITH max_len = 20, tau = 1.0, alpha = 0.5, clean_edges = true
WHERE length(phrase) <= 5 AND support > 1
GROUP BY phrase
ORDER BY score DESC, support
LIMIT 5 OFFSET 10;
