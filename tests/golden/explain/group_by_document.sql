SELECT phrase, score, support FROM MASKED('Thessaloniki is a city in [MASK].') WITH evidence = 1 GROUP BY document LIMIT 4
