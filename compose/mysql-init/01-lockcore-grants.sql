-- Run once by the mysql image on first start (after MYSQL_USER is created).
-- Lets the lockcore user see and KILL other sessions (fault-injection tests).
GRANT PROCESS, CONNECTION_ADMIN ON *.* TO 'lockcore'@'%';
