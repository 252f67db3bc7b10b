-- The console at a million orders: a customer's orders are found through an index,
-- not by reading every order.

-- An order's customer, as the orders list's filter asks for it.
CREATE INDEX orders_by_customer ON orders ((details ->> 'customer_id'));
