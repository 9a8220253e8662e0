SELECT phrase FROM MASKED(:q) AS OF :version USING exact
