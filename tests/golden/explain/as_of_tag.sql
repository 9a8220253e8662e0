SELECT phrase FROM MASKED('Thessaloniki is a city in [MASK].') AS OF 'wiki-2019' USING bm25 WITH no_stopwords = TRUE, clean_edges = FALSE
