SELECT phrase FROM MASKED('Salem is the capital of [MASK].') USING bm25(blocks => 5) WHERE doc.meta.year >= 2000 AND doc.id LIKE 'wn:%' AND phrase NOT IN ('the', 'a')
