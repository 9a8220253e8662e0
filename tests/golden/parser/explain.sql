EXPLAIN SELECT phrase FROM MASKED(?) USING hybrid(k => 1024, blocks => 3)
