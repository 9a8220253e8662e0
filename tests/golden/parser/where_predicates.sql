SELECT phrase FROM EVIDENCE('[MASK]')
WHERE phrase LIKE 'Th%'
  AND phrase NOT LIKE '%_x'
  AND doc.id IN ('d1', 'd2', ?)
  AND doc.id NOT IN (:a, :b)
  AND score BETWEEN 0.1 AND 1
  AND support NOT BETWEEN -1 AND 2 + 3
  AND title IS NULL
  AND NOT doc.meta.year IS NOT NULL
