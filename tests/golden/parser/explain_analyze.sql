explain analyze select phrase from masked(:q) limit 5;
