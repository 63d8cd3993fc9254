-- written by cdclake scaffold, then edited: a source transaction is applied once all its changes have landed
{{ config(materialized='cdc_silver', keys=['id'], complete_transactions='ifxserver_transaction') }}
select * from {{ source('bronze', 'ifxserver_informix_customers') }}
