#!/bin/bash
set -euo pipefail
cd /app
sqlite3 shop.db <<'SQL'
DROP VIEW IF EXISTS shipped_2023;
CREATE VIEW shipped_2023 AS
SELECT c.name AS customer, c.country AS country, COUNT(DISTINCT o.id) AS orders,
       printf('%.2f', SUM(i.qty * i.price)) AS revenue
FROM customers c
JOIN orders o ON o.customer_id = c.id
JOIN order_items i ON i.order_id = o.id
WHERE o.status = 'shipped' AND o.order_date >= '2023-01-01' AND o.order_date < '2024-01-01'
GROUP BY c.id
ORDER BY SUM(i.qty * i.price) DESC, c.name;
SQL
sqlite3 -header -separator , shop.db 'SELECT * FROM shipped_2023;' > report.csv
